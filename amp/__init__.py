"""
amp: an admission mutation proxy for Kubernetes.

The API server sends amp an AdmissionReview for every Pod created in an
opted-in namespace; amp forwards the Pod to the endpoint named by the
namespace, checks the JSON Patch that comes back and answers the API server.
"""

__version__ = "0.1.0"
