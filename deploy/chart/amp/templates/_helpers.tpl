{{/*
Names, labels and amp's configuration, shared by the templates.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "amp.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name: fullnameOverride, else the release name, with
the chart's name (or nameOverride) added unless it already contains it
(release "amp" gives "amp"). */}}
{{- define "amp.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "amp.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object: Kubernetes' recommended ones.  (deploy/render
writes managed-by kustomize into the manifests it renders from these.) */}}
{{- define "amp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "amp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: amp
{{- end -}}

{{/* What the Deployment, the Service, the PDB and the spread select.  amp
is one webhook per cluster (its webhook configuration and ClusterRole are
cluster-wide), so the selector is the one the kustomize manifests always had:
a Deployment's selector cannot change in place. */}}
{{- define "amp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "amp.name" . }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "amp.tlsSecret" -}}
{{- include "amp.fullname" . }}-tls
{{- end -}}

{{/* amp's own CA and serving certificate, with registration.managed. */}}
{{- define "amp.ownCertificates" -}}
{{- include "amp.fullname" . }}-certificates
{{- end -}}

{{- define "amp.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The DNS names of amp's Service the API server calls. */}}
{{- define "amp.serviceHosts" -}}
{{- $svc := printf "%s.%s.svc" (include "amp.fullname" .) .Release.Namespace -}}
{{- list $svc (printf "%s.cluster.local" $svc) | toJson -}}
{{- end -}}

{{/* The ports amp listens on, from its configuration (amp's defaults). */}}
{{- define "amp.webhookPort" -}}
{{- (.Values.config.listen | default dict).port | default 8443 | int -}}
{{- end -}}
{{- define "amp.metricsPort" -}}
{{- (.Values.config.metrics | default dict).port | default 9090 | int -}}
{{- end -}}

{{/*
The webhook entries, as a JSON list of {name, failurePolicy, operator,
other}: with webhook.failureClasses one per failure class, each selecting
on the failure-class label (the class of webhook.failurePolicy also takes
namespaces without the label: NotIn the other class), named
<class>.<webhook.name>; else the one entry webhook.name.
*/}}
{{- define "amp.webhookEntries" -}}
{{- $w := .Values.webhook -}}
{{- if $w.failureClasses.enabled -}}
{{- $default := $w.failurePolicy -}}
{{- $other := ternary "Fail" "Ignore" (eq $default "Ignore") -}}
{{- list (dict "name" (printf "%s.%s" (lower $default) $w.name) "failurePolicy" $default "operator" "NotIn" "other" $other) (dict "name" (printf "%s.%s" (lower $other) $w.name) "failurePolicy" $other "operator" "In" "other" $other) | toJson -}}
{{- else -}}
{{- list (dict "name" $w.name "failurePolicy" $w.failurePolicy "operator" "" "other" "") | toJson -}}
{{- end -}}
{{- end -}}

{{/* The entry amp's failure_policy auto follows: the one that selects the
namespaces without a failure-class label. */}}
{{- define "amp.defaultWebhookName" -}}
{{- (first (include "amp.webhookEntries" . | fromJsonArray)).name -}}
{{- end -}}

{{/*
amp.yaml: config from the values, with what the manifests decide set by the
chart: the certificate files (the mounted Secret), the webhook configuration
amp follows, and the default deadline (the webhook's timeoutSeconds).
*/}}
{{- define "amp.config" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- $tls := deepCopy ($config.tls | default dict) -}}
{{- $_ := set $tls "cert" "/etc/amp/tls/tls.crt" -}}
{{- $_ := set $tls "key" "/etc/amp/tls/tls.key" -}}
{{- $_ := set $config "tls" $tls -}}
{{- $kube := deepCopy ($config.kubernetes | default dict) -}}
{{- $_ := set $kube "webhook_configuration" .Values.webhook.configurationName -}}
{{- $_ := set $kube "webhook_name" (include "amp.defaultWebhookName" .) -}}
{{- $_ := set $kube "failure_class_label" (ternary .Values.webhook.failureClasses.label nil .Values.webhook.failureClasses.enabled) -}}
{{- $_ := set $kube "own_namespace" .Release.Namespace -}}
{{- if not (hasKey $kube "protected_namespaces") -}}
{{- $_ := set $kube "protected_namespaces" (.Values.webhook.excludeNamespaces | default list) -}}
{{- end -}}
{{- $_ := set $config "kubernetes" $kube -}}
{{- if .Values.registration.managed -}}
{{- $registration := deepCopy ($config.registration | default dict) -}}
{{- $_ := set $registration "managed" true -}}
{{- $_ := set $registration "service" (include "amp.fullname" .) -}}
{{- $_ := set $registration "service_port" (int .Values.service.port) -}}
{{- $_ := set $registration "entry_name" .Values.webhook.name -}}
{{- $_ := set $registration "default_class" .Values.webhook.failurePolicy -}}
{{- $_ := set $registration "secret" (include "amp.ownCertificates" .) -}}
{{- if not (hasKey $registration "match_expressions") -}}
{{- $_ := set $registration "match_expressions" (.Values.webhook.namespaceSelector.matchExpressions | default list) -}}
{{- end -}}
{{- $_ := set $config "registration" $registration -}}
{{- end -}}
{{- $deadline := deepCopy ($config.deadline | default dict) -}}
{{- $_ := set $deadline "default_timeout" (printf "%ds" (int .Values.webhook.timeoutSeconds)) -}}
{{- $_ := set $config "deadline" $deadline -}}
{{- toYaml $config -}}
{{- end -}}

{{/*
The self-signed path (certManager.enabled false, no selfSigned.caBundle):
a private CA, reused from the Secret <fullname>-ca when it exists, and a
serving certificate issued from it for the Service's names.  Made once per
render and kept in .Values, so the Secrets and the webhook's caBundle agree.
*/}}
{{- define "amp.selfSigned" -}}
{{- if not (hasKey .Values "_ampSelfSigned") -}}
{{- $caName := printf "%s-ca" (include "amp.fullname" .) -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $caName -}}
{{- $ca := dict -}}
{{- if and $existing $existing.data (hasKey $existing.data "tls.crt") (hasKey $existing.data "tls.key") -}}
{{- $ca = buildCustomCert (index $existing.data "tls.crt") (index $existing.data "tls.key") -}}
{{- else -}}
{{- $ca = genCAWithKey $caName (int .Values.selfSigned.caDays) (genPrivateKey "ecdsa") -}}
{{- end -}}
{{- $hosts := include "amp.serviceHosts" . | fromJsonArray -}}
{{- $cert := genSignedCertWithKey (first $hosts) nil $hosts (int .Values.selfSigned.certificateDays) $ca (genPrivateKey "ecdsa") -}}
{{- $_ := set .Values "_ampSelfSigned" (dict "caCert" $ca.Cert "caKey" $ca.Key "cert" $cert.Cert "key" $cert.Key) -}}
{{- end -}}
{{- end -}}

{{/* The webhook's caBundle when cert-manager does not inject it. */}}
{{- define "amp.caBundle" -}}
{{- if .Values.selfSigned.caBundle -}}
{{- .Values.selfSigned.caBundle -}}
{{- else -}}
{{- include "amp.selfSigned" . -}}
{{- .Values._ampSelfSigned.caCert | b64enc -}}
{{- end -}}
{{- end -}}

{{/* The Pods' annotations: the config checksum (a change of amp.yaml rolls
the Deployment), the prometheus.io scrape hints, and podAnnotations. */}}
{{- define "amp.podAnnotations" -}}
{{- $a := deepCopy (.Values.podAnnotations | default dict) -}}
{{- if .Values.configChecksum -}}
{{- $_ := set $a "checksum/config" (include "amp.config" . | sha256sum) -}}
{{- end -}}
{{- if .Values.monitoring.podAnnotations -}}
{{- $_ := set $a "prometheus.io/scrape" "true" -}}
{{- $_ := set $a "prometheus.io/port" (include "amp.metricsPort" .) -}}
{{- $_ := set $a "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- if $a -}}
{{- toYaml $a -}}
{{- end -}}
{{- end -}}

{{/* An amp duration (250ms, 2s, 1m, 1h, or bare seconds) in seconds. */}}
{{- define "amp.seconds" -}}
{{- $d := toString . -}}
{{- if regexMatch "^[0-9.]+ms$" $d -}}{{ divf (trimSuffix "ms" $d | float64) 1000 }}
{{- else if regexMatch "^[0-9.]+s$" $d -}}{{ trimSuffix "s" $d | float64 }}
{{- else if regexMatch "^[0-9.]+m$" $d -}}{{ mulf (trimSuffix "m" $d | float64) 60 }}
{{- else if regexMatch "^[0-9.]+h$" $d -}}{{ mulf (trimSuffix "h" $d | float64) 3600 }}
{{- else if regexMatch "^[0-9.]+$" $d -}}{{ $d | float64 }}
{{- else -}}{{ fail (printf "config.listen.drain_timeout: expected a duration like 250ms, 2s or 1m, got %q" $d) }}
{{- end -}}
{{- end -}}

{{/*
The Pods' terminationGracePeriodSeconds: preStop, then amp's drain
(config.listen.drain_timeout; 30s is amp's default), then a few seconds to
exit.  A value set explicitly must leave room for both.
*/}}
{{- define "amp.terminationGracePeriodSeconds" -}}
{{- $drain := (.Values.config.listen | default dict).drain_timeout | default "30s" -}}
{{- $needed := add (int .Values.preStopSleepSeconds) (include "amp.seconds" $drain | float64 | ceil | int) 5 -}}
{{- with .Values.terminationGracePeriodSeconds -}}
{{- if lt (int .) (int $needed) -}}
{{- fail (printf "terminationGracePeriodSeconds %d is too short: preStop (%ds) + amp's drain (config.listen.drain_timeout %s) + 5s to exit need %d" (int .) (int $.Values.preStopSleepSeconds) $drain (int $needed)) -}}
{{- end -}}
{{- . -}}
{{- else -}}
{{- $needed -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the bypassed-Pod report is on (config.kubernetes.bypass.enabled),
else empty; and the name of its Lease.
*/}}
{{- define "amp.bypass" -}}
{{- $bypass := ((.Values.config | default dict).kubernetes | default dict).bypass | default dict -}}
{{- if $bypass.enabled -}}true{{- end -}}
{{- end -}}

{{- define "amp.bypassLease" -}}
{{- $bypass := ((.Values.config | default dict).kubernetes | default dict).bypass | default dict -}}
{{- $bypass.lease_name | default "amp-bypass-reporter" -}}
{{- end -}}

{{- define "amp.audit" -}}
{{- $audit := (.Values.config | default dict).audit | default dict -}}
{{- if $audit.continuous -}}true{{- end -}}
{{- end -}}

{{- define "amp.auditLease" -}}
{{- $audit := (.Values.config | default dict).audit | default dict -}}
{{- $audit.lease_name | default "amp-audit" -}}
{{- end -}}

{{/* A CPU quantity (250m, 1, 1.5) in millicores. */}}
{{- define "amp.millicores" -}}
{{- $q := toString . -}}
{{- if hasSuffix "m" $q -}}{{ trimSuffix "m" $q | int }}
{{- else -}}{{ mulf ($q | float64) 1000 | int }}
{{- end -}}
{{- end -}}

{{/*
The autoscaler's checks (autoscaling.enabled): a CPU request to take the
percentage of; a target one Pod can reach (amp's config.workers processes
use at most a core each, and no more than limits.cpu); a minReplicas that
leaves the PodDisruptionBudget a replica to evict.
*/}}
{{- define "amp.autoscalingChecks" -}}
{{- $a := .Values.autoscaling -}}
{{- $requests := (.Values.resources | default dict).requests | default dict -}}
{{- if not $requests.cpu -}}
{{- fail "autoscaling.enabled: needs resources.requests.cpu (the target is a percentage of it)" -}}
{{- end -}}
{{- if gt (int $a.minReplicas) (int $a.maxReplicas) -}}
{{- fail (printf "autoscaling.minReplicas %d is above autoscaling.maxReplicas %d" (int $a.minReplicas) (int $a.maxReplicas)) -}}
{{- end -}}
{{- $workers := (.Values.config | default dict).workers | default 1 | int -}}
{{- $reach := mul $workers 1000 -}}
{{- $limits := (.Values.resources | default dict).limits | default dict -}}
{{- if $limits.cpu -}}
{{- $reach = min $reach (include "amp.millicores" $limits.cpu | int) -}}
{{- end -}}
{{- $target := div (mul (include "amp.millicores" $requests.cpu | int) (int $a.targetCPUUtilizationPercentage)) 100 -}}
{{- if ge $target $reach -}}
{{- fail (printf "autoscaling.targetCPUUtilizationPercentage %d of resources.requests.cpu %v is %dm, which one Pod never reaches: it uses at most %dm (config.workers %d at a core each, limits.cpu %v)" (int $a.targetCPUUtilizationPercentage) $requests.cpu $target $reach $workers ($limits.cpu | default "none")) -}}
{{- end -}}
{{- $pdb := .Values.podDisruptionBudget -}}
{{- if and $pdb.enabled (not (kindIs "string" $pdb.minAvailable)) (ge (int $pdb.minAvailable) (int $a.minReplicas)) -}}
{{- fail (printf "autoscaling.minReplicas %d: podDisruptionBudget.minAvailable %d would let no replica be evicted (a drain would block); use a minReplicas above it" (int $a.minReplicas) (int $pdb.minAvailable)) -}}
{{- end -}}
{{- end -}}
