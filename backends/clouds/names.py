"""The clouds' well-known names: the pod token audiences their exchanges take, the
ServiceAccount annotations that name a pod's cloud identity, the EKS Pod Identity agent's
addresses. No imports, so dialects and options (`check`, start-up) use them without loading any
wire."""

#: AWS: AssumeRoleWithWebIdentity's (IRSA) audience, and the EKS Pod Identity agent's.
IRSA_AUDIENCE = "sts.amazonaws.com"
POD_IDENTITY_AUDIENCE = "pods.eks.amazonaws.com"
#: The IRSA role a ServiceAccount names.
ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
#: The EKS Pod Identity agent's link-local addresses, IPv4 first (as the AWS SDKs try them).
POD_IDENTITY_IPV4 = "http://169.254.170.23/v1/credentials"
POD_IDENTITY_IPV6 = "http://[fd00:ec2::23]/v1/credentials"
#: Microsoft Entra workload identity federation's audience.
AZURE_AUDIENCE = "api://AzureADTokenExchange"
#: The Google service account a (GKE) ServiceAccount names.
GSA_ANNOTATION = "iam.gke.io/gcp-service-account"
