{{/* Shared helpers. Object names are fixed (the AWS documents refer to them by name), not release-derived, except
     the one cluster-scoped object that serves every component of a release (neuron.releaseScopedName). */}}

{{- define "neuron.chart" -}}
{{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "neuron.labels" -}}
helm.sh/chart: {{ include "neuron.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: neuron-helm-chart
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* Pod selector labels (immutable once installed: change them only with a new DaemonSet name). */}}
{{- define "neuron.devicePlugin.selectorLabels" -}}
name: neuron-device-plugin-ds
{{- end }}

{{- define "neuron.draDriver.selectorLabels" -}}
app.kubernetes.io/name: neuron-dra-driver
app.kubernetes.io/component: kubelet-plugin
{{- end }}

{{- define "neuron.npd.selectorLabels" -}}
app.kubernetes.io/name: neuron-node-problem-detector
{{- end }}

{{/* Namespace of a component: its `namespace` value, else the release namespace.
     Call with (dict "component" .Values.X "root" $). */}}
{{- define "neuron.namespace" -}}
{{ .component.namespace | default .root.Release.Namespace }}
{{- end }}

{{/* The name of a cluster-scoped object that serves more than one component of a release (the own-node policy):
     BASE.NAMESPACE.RELEASE, so that releases in other namespaces or of other names (the guide's two installs are
     both "neuron-helm-chart", in neuron-dra-driver and in default) each get their own. Namespaces have no dots, so
     the name is unambiguous; at most 20+1+63+1+53 characters of the 253 a DNS subdomain may have.
     Call with (dict "base" BASE "root" $). Objects of one component keep the component's fixed name. */}}
{{- define "neuron.releaseScopedName" -}}
{{- $name := printf "%s.%s.%s" .base .root.Release.Namespace .root.Release.Name -}}
{{- if gt (len $name) 253 -}}
{{- fail (printf "the object name %s is longer than 253 characters: use a shorter release name or namespace" $name) -}}
{{- end -}}
{{ $name }}
{{- end }}

{{/* The own-node ValidatingAdmissionPolicy of this release, and its binding. */}}
{{- define "neuron.ownNodePolicyName" -}}
{{ include "neuron.releaseScopedName" (dict "base" "neuron-own-node-keys" "root" .) }}
{{- end }}

{{/* Whether the chart creates a component's namespace: "true" or "". */}}
{{- define "neuron.createsNamespace" -}}
{{- $c := .component -}}
{{- $ns := include "neuron.namespace" . -}}
{{- $builtin := list "default" "kube-system" "kube-public" "kube-node-lease" -}}
{{- if and $c.enabled $c.createNamespace (ne $ns .root.Release.Namespace) (not (has $ns $builtin)) -}}
true
{{- end -}}
{{- end }}

{{/* The daemons' image; the digest wins over the tag. */}}
{{- define "neuron.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{ $img.repository }}@{{ $img.digest }}
{{- else -}}
{{ $img.repository }}:{{ $img.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{- define "neuron.npd.image" -}}
{{- $img := .Values.npd.image -}}
{{- if $img.digest -}}
{{ $img.repository }}@{{ $img.digest }}
{{- else -}}
{{ $img.repository }}:{{ $img.tag }}
{{- end -}}
{{- end }}

{{/* Pod affinity: the component's own `affinity` if set, else a required node affinity built from nodeSelection.
     Terms are ORed, so a node qualifies by instance type OR by label; each term also excludes compute types.
     Call with (dict "component" .Values.X "root" $). */}}
{{- define "neuron.affinity" -}}
{{- if .component.affinity -}}
{{ toYaml .component.affinity }}
{{- else -}}
{{- $sel := .root.Values.nodeSelection -}}
{{- $common := list (dict "key" "kubernetes.io/os" "operator" "In" "values" (list "linux")) -}}
{{- if $sel.excludeComputeTypes -}}
{{- $common = append $common (dict "key" "eks.amazonaws.com/compute-type" "operator" "NotIn" "values" $sel.excludeComputeTypes) -}}
{{- end -}}
{{- if and $sel.driverLabel .side -}}{{- /* migration, node by node: the device plugin runs where this label is not "dra" */ -}}
{{- $common = append $common (dict "key" $sel.driverLabel "operator" "NotIn" "values" (list "dra")) -}}
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

{{/* Environment every daemon of this image reads. Call with (dict "component" .Values.X "root" $). */}}
{{- define "neuron.daemonEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: KUBELET_ROOT
  value: {{ include "accel-dra.kubeletRoot" (dict "root" .root) | quote }}
- name: DEVICE_PLUGINS_DIR
  value: {{ include "accel-dra.devicePluginsDir" (dict "root" .root) | quote }}
- name: LOG_LEVEL
  value: {{ .root.Values.logLevel | quote }}
- name: LOG_FORMAT
  value: {{ .root.Values.logFormat | quote }}
- name: METRICS_PORT
  value: {{ ternary .component.metrics.port 0 .component.metrics.enabled | quote }}
{{- if .component.metrics.enabled }}
{{ include "accel-dra.metricsAddressEnv" .component.metrics.address }}
{{- end }}
{{- end }}

{{/* A headless metrics Service selecting a component's pods.
     Call with (dict "name" N "namespace" NS "selector" SELECTOR-YAML "port" P "root" $). */}}
{{- define "neuron.metricsService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ .name }}
  namespace: {{ .namespace }}
  labels:
    {{- include "neuron.labels" .root | nindent 4 }}
    {{- .selector | nindent 4 }}
spec:
  clusterIP: None
  selector:
    {{- .selector | nindent 4 }}
  ports:
    - name: metrics
      port: {{ .port }}
      targetPort: metrics
      protocol: TCP
{{- end }}

{{/* The Node labels and annotations the Neuron daemons (device plugin or DRA driver) keep on their own Node, as
     CEL list literals for own-node-policy.yaml. The daemons' lists: accel_core/awsfacts/ultraserver.py
     NODE_LABELS (tests/unit/neuron/test_charts_render.py checks the two agree). Add a key here when a daemon owns one. */}}
{{- define "neuron.ownedNodeLabels" -}}
{{ toJson (list
  "neuron.amazonaws.com/ultraserver-mode"
  "neuron.amazonaws.com/ultraserver-server-id-2"
  "neuron.amazonaws.com/ultraserver-node-id-2"
  "neuron.amazonaws.com/ultraserver-server-id-4"
  "neuron.amazonaws.com/ultraserver-node-id-4") }}
{{- end }}

{{- define "neuron.ownedNodeAnnotations" -}}
{{ toJson (list
  "neuron.amazonaws.com/device-usage") }}
{{- end }}

{{/* The CEL that tells core devices (neuron_dra/dra/cores.py, resourceType neuron_core) from the rest; call with the
     operator: "==" selects the cores (neuroncore.aws.com), "!=" everything else (neuron.aws.com with cores on). */}}
{{- define "neuron.coreSelector" -}}
device.driver == "neuron.aws.com" && device.attributes["neuron.aws.com"].resourceType {{ . }} "neuron_core"
{{- end }}
