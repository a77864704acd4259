"""gunicorn entry point: ``gunicorn wsgi:app``."""
from advisor import create_app

app = create_app()
