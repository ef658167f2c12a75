"""Google Secret Manager, with the GCP provider's parameters and GKE workload identity."""
