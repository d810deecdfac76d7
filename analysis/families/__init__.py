"""The kernel families, one folder each (``analysis.core.family`` says what every folder holds); the registry
that lists them is ``analysis.registry``."""
