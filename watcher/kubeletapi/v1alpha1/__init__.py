"""Generated code for the kubelet's Pods API v1alpha1 (`make proto`)."""
