"""Generated code for the subset of Kubernetes' own messages a Pod of the Pods API is (`make proto`)."""
