{{/* The chart's name, or nameOverride. */}}
{{- define "weir.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name of the release's objects: fullnameOverride, else the
release name, with the chart name added unless the release name has it. */}}
{{- define "weir.fullname" -}}
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

{{/* The labels every object carries. */}}
{{- define "weir.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "weir.selectorLabels" . }}
app.kubernetes.io/version: {{ include "weir.version" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The labels that select the pods. */}}
{{- define "weir.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The image tag: image.tag, else the chart's appVersion. */}}
{{- define "weir.version" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "weir.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "weir.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Whether weir.yaml is mounted: config given, or a ConfigMap of one's own. */}}
{{- define "weir.hasConfig" -}}
{{- if or .Values.existingConfigMap .Values.config }}true{{ end }}
{{- end }}

{{/* Whether an envoyproxy/ratelimit directory is mounted. */}}
{{- define "weir.hasEnvoy" -}}
{{- if or .Values.envoy.existingConfigMap .Values.envoy.files }}true{{ end }}
{{- end }}

{{/* Whether the chart makes its own Secret (Redis URL or admin token). */}}
{{- define "weir.hasSecret" -}}
{{- if or (and .Values.redis.url (not .Values.redis.existingSecret)) (and .Values.adminToken.value (not .Values.adminToken.existingSecret)) }}true{{ end }}
{{- end }}

{{/* Whether the probes can speak HTTP(S) to weir: not under mutual TLS,
which the kubelet cannot present a client certificate to. */}}
{{- define "weir.httpProbes" -}}
{{- if not (and .Values.tls.enabled .Values.tls.clientCA) }}true{{ end }}
{{- end }}

{{/* terminationGracePeriodSeconds: above the preStop sleep plus weir's
shutdown timeout. */}}
{{- define "weir.gracePeriod" -}}
{{- $floor := add .Values.shutdown.preStopSleepSeconds .Values.shutdown.timeoutSeconds }}
{{- if not (lt (int .Values.shutdown.delaySeconds) (int .Values.shutdown.timeoutSeconds)) }}
{{- fail "shutdown.delaySeconds must be below shutdown.timeoutSeconds (the timeout includes the delay)" }}
{{- end }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $floor 5 }}
{{- else if gt (int .Values.terminationGracePeriodSeconds) (int $floor) }}
{{- .Values.terminationGracePeriodSeconds }}
{{- else }}
{{- fail (printf "terminationGracePeriodSeconds %v must be above shutdown.preStopSleepSeconds + shutdown.timeoutSeconds (%v)" .Values.terminationGracePeriodSeconds $floor) }}
{{- end }}
{{- end }}
