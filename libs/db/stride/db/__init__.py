"""Storage for services that own tables: one SQLAlchemy URL, PostgreSQL or SQLite.

On PostgreSQL every service lives in its own schema (named after the service) of a shared
database; on SQLite each service has its own file. The same table code serves both.
"""
