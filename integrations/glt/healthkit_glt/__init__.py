"""healthkit integration for graphlearn-torch."""
