"""Where the bytes go: the loss each choice (a rank per head, a window) is predicted to
cost from backward passes on the calibration tokens (sensitivity.py), a byte budget spent
by that prediction (allocate.py), the sensitivity and mixed settings it gives
(choices.py), every setting measured per target ratio with its calibration check
(settings.py), and how well the predictions agree with what is measured (agreement.py).
"""
