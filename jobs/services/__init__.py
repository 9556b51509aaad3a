"""Every write in the jobs app (docs/dev/style.md rule 1), by topic: lifecycle (job transitions),
inputs (uploads and ingests), webhooks (signed deliveries)."""
