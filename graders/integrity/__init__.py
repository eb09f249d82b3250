"""Integrity checks a score job runs beside the grade: contamination and model identity."""
