"""One router per resource (FastAPI "Bigger Applications")."""
