"""The ``stride`` command line: submit and watch jobs, run the suite locally."""
