"""Simulation vs reality on this machine (``rollart validate``)."""
