"""From source ids to translations: search, sampling, rules on the scores, ensembles, int8, Translator."""
