"""healthkit integration for Alibaba graph-learn."""
