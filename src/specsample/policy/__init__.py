"""How long to draft (-k auto): the planner, its estimates and prices, and the
calibration that gives the prices their prior."""
