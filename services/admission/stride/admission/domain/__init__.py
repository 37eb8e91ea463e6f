"""Admission's pure domain: job spec rules and admission policies. No I/O imports."""
