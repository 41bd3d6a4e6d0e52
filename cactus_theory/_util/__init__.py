"""Ground floor: files (atomic writes, locks, checked outputs), progress bars, paths of the user
cache, probes of the machine (load while a timing runs). Imports nothing of the package, and only
the standard library (tqdm for the bars, loaded when a bar is drawn)."""
