"""Stages in order with checkpoint lineage, an atomic manifest, resume, and evaluation after each stage."""
