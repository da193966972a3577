"""How large a file may be: the files' readers and the server's settings share these (standard library only, so
that `nanomt serve --help` imports nothing more)."""

MAX_FILE_BYTES = 10 * 2**20  # the largest file taken (nanomt serve --file-limit's default, as the page says)
UNZIPPED_PER_BYTE = 4  # a zipped format (.docx) may unpack to at most this many times its limit
MAX_TEXT_CHARS = 500_000  # the most characters of text one file may send to the model
