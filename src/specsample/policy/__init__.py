"""How long to draft (-k auto): the planner, its estimates and prices, the calibration
that gives the prices their prior, the one configuration of its numbers (config.py),
and the factory that makes a policy where the models are known (make.py)."""
