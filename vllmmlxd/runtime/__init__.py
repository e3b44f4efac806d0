"""Process-level set-up of a worker before the engine loads: CPU shares and the BLAS library.

Stdlib only, and never imports mlx: the BLAS must be chosen before mlx is imported, and
the daemon plans CPU shares without touching the engine.
"""
