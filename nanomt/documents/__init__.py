"""Documents around the Translator: sentences, segmentation, markup, files."""
