"""Acting: the typed steps a decision returns (steps.py) and the one executor that does them
(execute.py), each step guarded and reported, so that a dry run is the same plan not carried out."""
