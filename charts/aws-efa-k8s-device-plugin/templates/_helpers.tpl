{{/* Shared helpers. Names do not depend on the release name: the AWS documents refer to them. */}}

{{- define "efa.fullname" -}}
{{ .Values.fullnameOverride | default "aws-efa-k8s-device-plugin" | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "efa.chart" -}}
{{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "efa.labels" -}}
helm.sh/chart: {{ include "efa.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: aws-efa-k8s-device-plugin
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* Pod selector labels; `name` is what `kubectl get pods -l name=aws-efa-k8s-device-plugin` selects. */}}
{{- define "efa.selectorLabels" -}}
name: {{ include "efa.fullname" . }}
{{- end }}

{{- define "efa.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{ $img.repository }}@{{ $img.digest }}
{{- else -}}
{{ $img.repository }}:{{ $img.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{- define "efa.namespace" -}}
{{ .Values.namespace | default .Release.Namespace }}
{{- end }}
