"""Each cloud's workload identity in one place: the exchanges that turn a pod's service-account
token into a cloud credential (AWS STS, Google STS and IAM Credentials, Entra ID assertions).
The cloud stores (aws, gcp, azure) and Vault's cloud logins both call them; like `wire` and
`proxies`, this package sits beside the stores and imports none of them."""
