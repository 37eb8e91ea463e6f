"""Backends that turn recorded plans into pods: local processes now, Kubernetes later."""
