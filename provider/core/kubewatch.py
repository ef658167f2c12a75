"""List+watch of Kubernetes objects, resumed by resourceVersion and relisted after 410 Gone."""
