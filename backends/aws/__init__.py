"""AWS Secrets Manager and SSM Parameter Store, speaking the AWS provider's dialect."""
