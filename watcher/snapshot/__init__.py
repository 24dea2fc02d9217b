"""`pod-resources-watcher snapshot`: one look at the node (take), its Pods API part (pods), the
page that draws it (html), and what they share (common)."""
