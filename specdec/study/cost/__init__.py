"""The cost model: profiles, fits, predictions, rooflines and the verdict across machines."""
