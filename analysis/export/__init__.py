"""A run's figures in other tools' formats: Perfetto/Chrome traces and CSV/Parquet tables
(files), OpenMetrics text (openmetrics) and the live HTTP endpoint for a Prometheus scrape (metrics_server)."""
