"""HTTP front end: FastAPI app (REST + Open Inference Protocol v2), metrics, health."""
