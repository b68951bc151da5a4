"""Named recipes: functions that return a complete manifest and the small data files it uses.

``demo`` is what the README's main command runs (a few minutes on two CPU processes); ``test``
is the same shape with tiny budgets, for the test suite. Data is generated deterministically —
nothing is downloaded.
"""

from __future__ import annotations

from ito.recipes.arithmetic import RECIPES, Recipe, build_recipe

__all__ = ["RECIPES", "Recipe", "build_recipe"]
