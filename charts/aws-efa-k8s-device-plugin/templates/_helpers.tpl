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

{{/* `affinity` if set, else a required node affinity from nodeSelection: one term per rule (terms are ORed), each
     also excluding the listed compute types. */}}
{{- define "efa.affinity" -}}
{{- if .Values.affinity -}}
{{ toYaml .Values.affinity }}
{{- else -}}
{{- $sel := .Values.nodeSelection -}}
{{- $common := list (dict "key" "kubernetes.io/os" "operator" "In" "values" (list "linux")) -}}
{{- if $sel.excludeComputeTypes -}}
{{- $common = append $common (dict "key" "eks.amazonaws.com/compute-type" "operator" "NotIn" "values" $sel.excludeComputeTypes) -}}
{{- end -}}
{{- with $sel.driverLabel -}}{{- /* migration, node by node: the device plugin runs where this label is not "dra" */ -}}
{{- $common = append $common (dict "key" . "operator" "NotIn" "values" (list "dra")) -}}
{{- end -}}
{{- $terms := list -}}
{{- if $sel.allNodes -}}
{{- $terms = append $terms (dict "matchExpressions" $common) -}}
{{- else -}}
{{- if $sel.instanceTypes -}}
{{- $byType := dict "key" "node.kubernetes.io/instance-type" "operator" "In" "values" $sel.instanceTypes -}}
{{- $terms = append $terms (dict "matchExpressions" (concat (list $byType) $common)) -}}
{{- end -}}
{{- range $sel.nodeLabels -}}
{{- $byLabel := dict "key" .key "operator" "Exists" -}}
{{- if .values -}}
{{- $byLabel = dict "key" .key "operator" "In" "values" .values -}}
{{- end -}}
{{- $terms = append $terms (dict "matchExpressions" (concat (list $byLabel) $common)) -}}
{{- end -}}
{{- end -}}
{{- if not $terms -}}
{{- fail "nodeSelection selects no node: give nodeSelection.instanceTypes, nodeSelection.nodeLabels, or nodeSelection.allNodes=true" -}}
{{- end -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      {{- toYaml $terms | nindent 6 }}
{{- end -}}
{{- end }}

{{/* METRICS_ADDRESS from metrics.address: podIP and hostIP come from the downward API, anything else is literal. */}}
{{- define "efa.metricsAddressEnv" -}}
- name: METRICS_ADDRESS
{{- if eq . "podIP" }}
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- else if eq . "hostIP" }}
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
{{- else }}
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/* Fake-sysfs mode (fakeHost.path): the daemon reads that directory, a hostPath mounted read-only at the same
     path, as its host root (--host-root) instead of /. For nodes without accelerators: tests, demos, CI. */}}
{{- define "efa.fakeHostArgs" -}}
{{- with .Values.fakeHost.path }}, "--host-root", {{ . | quote }}{{ end }}
{{- end }}

{{- define "efa.fakeHostMount" -}}
{{- with .Values.fakeHost.path }}
- name: fake-host
  mountPath: {{ . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "efa.fakeHostVolume" -}}
{{- with .Values.fakeHost.path }}
- name: fake-host
  hostPath:
    path: {{ . }}
    type: Directory
{{- end }}
{{- end }}
