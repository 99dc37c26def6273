"""The Python side of ``launch/stage.sh``: backend choice, services, Ray head and job, local runs."""
