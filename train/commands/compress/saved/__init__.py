"""What compress writes and reads back: the compressed model with its bases (save.py,
--save DIR), that directory loaded to decode through its low-rank cache of codes
(load.py, load_compressed; each kind of model served by its target class), and the
compress document kept in a run's variant directory for `rankzoo report` (record.py,
--record).
"""
