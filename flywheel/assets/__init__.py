"""Software-defined assets, one module per stage. Each is thin: read, call plain code, write, report."""
