"""What each cache slot keeps: the calibration and evaluation data (calibrate.py), the
statistics, bases, projectors and byte counts of a slot (lowrank.py), the output-aware
weights that make a basis lose least of what its reader sees (readout.py), and the windows
of recent keys plus sinks a KV head may be read through instead (windows.py); the math
every other room builds on, reading nothing of compress but its options.
"""
