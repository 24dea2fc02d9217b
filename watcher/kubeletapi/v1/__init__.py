"""Generated code for the kubelet pod-resources v1 API (`make proto`)."""
