"""``python -m stride.cli`` runs the same command as ``stride``."""

from stride.cli.main import app

if __name__ == "__main__":
    app(prog_name="stride")
