"""Verification tools over the spec: the CrossHair contract check (:mod:`.crosshair_check`)."""
