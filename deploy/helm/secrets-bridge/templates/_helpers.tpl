{{/* The chart name, overridable. */}}
{{- define "secrets-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource names: the release name when it contains the chart name, else <release>-<chart>. */}}
{{- define "secrets-bridge.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "secrets-bridge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: immutable once installed. */}}
{{- define "secrets-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "secrets-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object; part-of as the kustomize base sets it. */}}
{{- define "secrets-bridge.labels" -}}
helm.sh/chart: {{ include "secrets-bridge.chart" . }}
{{ include "secrets-bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: secrets-bridge
{{- end }}

{{- define "secrets-bridge.hmacSecretName" -}}
{{- .Values.hmacKey.existingSecret | default (printf "%s-hmac" (include "secrets-bridge.fullname" .)) }}
{{- end }}

{{- define "secrets-bridge.image" -}}
{{- $ref := printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- if .Values.image.digest }}{{ $ref = printf "%s@%s" $ref .Values.image.digest }}{{ end }}
{{- $ref }}
{{- end }}

{{/*
A number or string as the provider reads it: whole numbers without an exponent or a ".0"
(values files give float64: 4194304 would otherwise print as 4.194304e+06).
*/}}
{{- define "secrets-bridge.str" -}}
{{- if or (kindIs "float64" .) (kindIs "float32" .) }}
{{- if eq (floor .) (float64 .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/*
One optional flag, as a YAML list item "--<flag>=<value>", only when the value is set and
differs from the provider's default. Call with (list "flag-name" $value $default).
*/}}
{{- define "secrets-bridge.optionalFlag" -}}
{{- $flag := index . 0 }}
{{- $value := include "secrets-bridge.str" (index . 1) }}
{{- $default := include "secrets-bridge.str" (index . 2) }}
{{- if and (ne $value "") (ne $value $default) }}
{{ printf "- %s" (printf "--%s=%s" $flag $value | toJson) }}
{{- end }}
{{- end }}

{{/* --rate-limit=backend=rate,... in backend order. */}}
{{- define "secrets-bridge.rateLimits" -}}
{{- $items := list }}
{{- range $backend := keys .Values.rateLimits | sortAlpha }}
{{- $items = append $items (printf "%s=%s" $backend (include "secrets-bridge.str" (index $.Values.rateLimits $backend))) }}
{{- end }}
{{- join "," $items }}
{{- end }}

{{/* Settings the schema cannot express, refused with a message. */}}
{{- define "secrets-bridge.validate" -}}
{{- if le (float64 .Values.terminationGracePeriodSeconds) (float64 .Values.gracePeriodSeconds) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be above gracePeriodSeconds (%v): the provider needs that time to drain mounts and remove its socket" .Values.terminationGracePeriodSeconds .Values.gracePeriodSeconds) }}
{{- end }}
{{- end }}

{{/* The provider flags that differ from the provider's defaults, one list item each. */}}
{{- define "secrets-bridge.optionalArgs" -}}
{{- include "secrets-bridge.optionalFlag" (list "cache-ttl" .Values.cache.ttl 0) }}
{{- include "secrets-bridge.optionalFlag" (list "min-refresh-interval" .Values.cache.minRefreshInterval 30) }}
{{- include "secrets-bridge.optionalFlag" (list "max-refresh-interval" .Values.cache.maxRefreshInterval 3600) }}
{{- include "secrets-bridge.optionalFlag" (list "revalidate-max-age" .Values.cache.revalidateMaxAge 600) }}
{{- include "secrets-bridge.optionalFlag" (list "serve-stale-max-age" .Values.cache.serveStaleMaxAge 0) }}
{{- include "secrets-bridge.optionalFlag" (list "serve-stale-wait" .Values.cache.serveStaleWait 3) }}
{{- include "secrets-bridge.optionalFlag" (list "store-call-timeout" .Values.cache.storeCallTimeout 10) }}
{{- include "secrets-bridge.optionalFlag" (list "cache-scope" .Values.cache.scope "serviceaccount") }}
{{- include "secrets-bridge.optionalFlag" (list "max-concurrent-fetches" .Values.cache.maxConcurrentFetches 64) }}
{{- include "secrets-bridge.optionalFlag" (list "max-concurrent-fetches-per-namespace" .Values.cache.maxConcurrentFetchesPerNamespace 16) }}
{{- include "secrets-bridge.optionalFlag" (list "rate-limit" (include "secrets-bridge.rateLimits" .) "") }}
{{- include "secrets-bridge.optionalFlag" (list "max-objects" .Values.limits.maxObjects 100) }}
{{- include "secrets-bridge.optionalFlag" (list "max-read-bytes" .Values.limits.maxReadBytes 67108864) }}
{{- include "secrets-bridge.optionalFlag" (list "max-read-bytes-per-namespace" .Values.limits.maxReadBytesPerNamespace 16777216) }}
{{- include "secrets-bridge.optionalFlag" (list "max-response-bytes" .Values.limits.maxResponseBytes 4194304) }}
{{- include "secrets-bridge.optionalFlag" (list "renew-at" .Values.lifetimes.renewAt "2/3") }}
{{- include "secrets-bridge.optionalFlag" (list "lease-idle-after" .Values.lifetimes.leaseIdleAfter 600) }}
{{- include "secrets-bridge.optionalFlag" (list "max-held-credentials" .Values.lifetimes.maxHeldCredentials 10000) }}
{{- include "secrets-bridge.optionalFlag" (list "min-renew-interval" .Values.lifetimes.minRenewInterval 300) }}
{{- include "secrets-bridge.optionalFlag" (list "replaced-credential-grace" .Values.lifetimes.replacedCredentialGrace 300) }}
{{- include "secrets-bridge.optionalFlag" (list "allow-node-identity-namespaces" (join "," .Values.allowNodeIdentityNamespaces) "") }}
{{- if .Values.strictParameters }}
- --strict-parameters
{{- end }}
{{- include "secrets-bridge.optionalFlag" (list "audit-log" .Values.auditLog "") }}
{{- with .Values.vault }}
{{- include "secrets-bridge.optionalFlag" (list "vault-addr" .address "") }}
{{- include "secrets-bridge.optionalFlag" (list "vault-namespace" .namespace "") }}
{{- include "secrets-bridge.optionalFlag" (list "vault-ca-cert" .caCert "") }}
{{- include "secrets-bridge.optionalFlag" (list "vault-ca-dir" .caDir "") }}
{{- include "secrets-bridge.optionalFlag" (list "vault-tls-server-name" .tlsServerName "") }}
{{- include "secrets-bridge.optionalFlag" (list "vault-client-cert" .clientCert "") }}
{{- include "secrets-bridge.optionalFlag" (list "vault-client-key" .clientKey "") }}
{{- include "secrets-bridge.optionalFlag" (list "vault-max-connections" .maxConnections 64) }}
{{- include "secrets-bridge.optionalFlag" (list "vault-request-timeout" .requestTimeout 0) }}
{{- include "secrets-bridge.optionalFlag" (list "vault-token-renew-margin" .tokenRenewMargin 0.2) }}
{{- end }}
{{- with .Values.aws }}
{{- include "secrets-bridge.optionalFlag" (list "aws-region" .region "") }}
{{- include "secrets-bridge.optionalFlag" (list "aws-endpoints" .endpoints "") }}
{{- include "secrets-bridge.optionalFlag" (list "aws-sts-endpoint" .stsEndpoint "") }}
{{- include "secrets-bridge.optionalFlag" (list "aws-pod-identity-endpoint" .podIdentityEndpoint "") }}
{{- include "secrets-bridge.optionalFlag" (list "aws-max-concurrency" .maxConcurrency 32) }}
{{- include "secrets-bridge.optionalFlag" (list "aws-connect-timeout" .connectTimeout 3) }}
{{- include "secrets-bridge.optionalFlag" (list "aws-read-timeout" .readTimeout 10) }}
{{- end }}
{{- with .Values.gcp }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-project" .project "") }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-location" .location "") }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-cluster" .cluster "") }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-workload-identity-audience" .workloadIdentityAudience "") }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-sts-endpoint" .stsEndpoint "") }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-iam-endpoint" .iamEndpoint "") }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-secretmanager-endpoint" .secretmanagerEndpoint "") }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-regional-endpoint" .regionalEndpoint "") }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-parametermanager-endpoint" .parametermanagerEndpoint "") }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-parametermanager-regional-endpoint" .parametermanagerRegionalEndpoint "") }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-token-uris" (join "," .tokenUris) "") }}
{{- include "secrets-bridge.optionalFlag" (list "gcp-ca-file" .caFile "") }}
{{- end }}
{{- with .Values.azure }}
{{- include "secrets-bridge.optionalFlag" (list "azure-authority-host" .authorityHost "") }}
{{- include "secrets-bridge.optionalFlag" (list "azure-vault-dns-suffix" .vaultDnsSuffix "") }}
{{- include "secrets-bridge.optionalFlag" (list "azure-ca-file" .caFile "") }}
{{- include "secrets-bridge.optionalFlag" (list "azure-connect-to" .connectTo "") }}
{{- include "secrets-bridge.optionalFlag" (list "azure-token-proxy-url" .tokenProxyUrl "") }}
{{- include "secrets-bridge.optionalFlag" (list "azure-sni-name" .sniName "") }}
{{- include "secrets-bridge.optionalFlag" (list "azure-token-proxy-ca-file" .tokenProxyCaFile "") }}
{{- end }}
{{- end }}
