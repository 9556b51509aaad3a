"""Every write in the jobs app (STYLE.md rule 1), by topic: lifecycle (job transitions),
inputs (uploads and ingests), webhooks (signed deliveries)."""
