"""The Kubernetes backend: training pods as pods, watched through informers."""
