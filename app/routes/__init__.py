"""One router per resource; ``app.main.create_app`` includes them all."""
