"""Reading runs back: loaders, the run index, importers of other tools' logs.

Reads files only; never imports the recording side (``run``, ``pipeline``).
"""
