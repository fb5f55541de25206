{{/* One device plugin's objects: its ServiceAccount (a token only with nodeEvents), the Role and binding for the
     Events it posts on its Node (namespace default, where node events live) and its DaemonSet.

     Call with (dict "root" $ "d" PLUGIN); PLUGIN is a dict:
       namespace           where the namespaced objects go
       labels              the chart's common labels (YAML text)
       selectorLabels      the pods' selector labels (YAML text; immutable once installed)
       extraPodLabels      more pod labels (YAML text, optional)
       names               dict: daemonSet, serviceAccount, container
       command             the console script (run as `<command> serve`)
       image               the image reference
       draDriverName       the DRA driver of the same hardware: its presence directory is mounted read-only (the
                           coexistence rule: the DRA driver wins)
       nodeEvents          post Events on its Node when it stands down and serves again (needs a token)
       config              the chart's device-plugin values; each key optional, defaults below: metrics (enabled,
                           port, address), updateStrategy, hostNetwork, resources, livenessProbe, readinessProbe
                           (an empty one: none), extraArgs, extraEnv
       pod                 dict, each key optional: podLabels, podAnnotations, priorityClassName, tolerations,
                           nodeSelector, affinity, securityContext
       terminationMessagePath  optional (a read-only /dev over /dev needs another path)
       hostMounts          list of dict: name, mountPath, hostPath, type, readOnly: the plugin's own host files
     Top-level values read from the chart, as for the DRA driver (_helpers.tpl). */}}
{{- define "accel-dra.devicePlugin" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .d.names.serviceAccount }}
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
automountServiceAccountToken: false
{{- if .d.nodeEvents }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .d.names.serviceAccount }}-node-events
  namespace: default
  labels:
    {{- .d.labels | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ .d.names.serviceAccount }}-node-events
  namespace: default
  labels:
    {{- .d.labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ .d.names.serviceAccount }}-node-events
subjects:
  - kind: ServiceAccount
    name: {{ .d.names.serviceAccount }}
    namespace: {{ .d.namespace }}
{{- end }}
---
{{ include "accel-dra.devicePluginDaemonSet" . }}
{{- end }}

{{/* The device plugin's DaemonSet alone. Call as "accel-dra.devicePlugin". */}}
{{- define "accel-dra.devicePluginDaemonSet" -}}
{{- $c := .d.config }}
{{- $pod := .d.pod | default dict }}
{{- $root := .root }}
{{- $kubelet := include "accel-dra.kubeletRoot" . }}
{{- $devicePlugins := include "accel-dra.devicePluginsDir" . }}
{{- $metrics := $c.metrics | default dict }}
{{- $readiness := ternary $c.readinessProbe (dict "periodSeconds" 5 "failureThreshold" 1) (hasKey $c "readinessProbe") }}
{{- /* A key the chart gives wins, even empty; a key it leaves out takes the library's default. */}}
{{- $security := dict "runAsUser" 0 "runAsNonRoot" false "privileged" false "allowPrivilegeEscalation" false
      "readOnlyRootFilesystem" true "capabilities" (dict "drop" (list "ALL")) }}
{{- $security = ternary $pod.securityContext $security (hasKey $pod "securityContext") }}
{{- $priority := ternary $pod.priorityClassName "system-node-critical" (hasKey $pod "priorityClassName") }}
{{- $resources := dict "requests" (dict "cpu" "10m" "memory" "64Mi") "limits" (dict "memory" "256Mi") }}
{{- $resources = ternary $c.resources $resources (hasKey $c "resources") }}
{{- $update := dict "type" "RollingUpdate" "rollingUpdate" (dict "maxUnavailable" 1) }}
{{- $update = ternary $c.updateStrategy $update (hasKey $c "updateStrategy") }}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ .d.names.daemonSet }}
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
    {{- .d.selectorLabels | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- .d.selectorLabels | nindent 6 }}
  updateStrategy:
    {{- toYaml $update | nindent 4 }}
  template:
    metadata:
      labels:
        {{- .d.labels | nindent 8 }}
        {{- .d.selectorLabels | nindent 8 }}
        {{- with .d.extraPodLabels }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with $pod.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $pod.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ .d.names.serviceAccount }}
      automountServiceAccountToken: {{ .d.nodeEvents | default false }}
      enableServiceLinks: false
      priorityClassName: {{ $priority }}
      hostNetwork: {{ $c.hostNetwork | default false }}
      {{- if $c.hostNetwork }}
      dnsPolicy: ClusterFirstWithHostNet
      {{- end }}
      securityContext:
        seccompProfile:
          type: RuntimeDefault
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $pod.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $pod.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- include "accel-dra.affinity" (dict "root" $root "d" (dict "pod" $pod "side" "device-plugin")) | nindent 8 }}
      containers:
        - name: {{ .d.names.container }}
          image: {{ .d.image }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: [{{ .d.command | quote }}, "serve"{{ include "accel-dra.fakeHostArgs" . }}]
          {{- with $c.extraArgs }}
          args:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            - name: KUBELET_ROOT
              value: {{ $kubelet | quote }}
            - name: DEVICE_PLUGINS_DIR
              value: {{ $devicePlugins | quote }}
            - name: LOG_LEVEL
              value: {{ $root.Values.logLevel | quote }}
            - name: LOG_FORMAT
              value: {{ $root.Values.logFormat | quote }}
            - name: METRICS_PORT
              value: {{ ternary $metrics.port 0 (not (not $metrics.enabled)) | quote }}
            {{- if $metrics.enabled }}
            {{- include "accel-dra.metricsAddressEnv" ($metrics.address | default "podIP") | nindent 12 }}
            {{- end }}
            {{- with $c.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- if $metrics.enabled }}
          ports:
            - name: metrics
              containerPort: {{ $metrics.port }}
              protocol: TCP
          {{- end }}
          {{- with $c.livenessProbe }}
          livenessProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- if and $metrics.enabled $readiness }}
          # Not ready while the DRA driver of the same hardware serves this node (/readyz answers 503 naming it).
          readinessProbe:
            httpGet:
              path: /readyz
              port: metrics
            {{- toYaml $readiness | nindent 12 }}
          {{- end }}
          securityContext:
            {{- toYaml $security | nindent 12 }}
          resources:
            {{- toYaml $resources | nindent 12 }}
          {{- with .d.terminationMessagePath }}
          terminationMessagePath: {{ . }}
          {{- end }}
          terminationMessagePolicy: FallbackToLogsOnError
          volumeMounts:
            # Registration with the kubelet and the plugin's own socket.
            - name: device-plugins
              mountPath: {{ $devicePlugins }}
            # The coexistence rule (the DRA driver wins): the DRA driver's registration socket and its presence
            # file, which outlives a restart of the driver's pod; read-only.
            - name: plugins-registry
              mountPath: {{ $kubelet }}/plugins_registry
              readOnly: true
            - name: dra-driver-presence
              mountPath: {{ $kubelet }}/plugins/{{ .d.draDriverName }}
              readOnly: true
            # The kubelet's PodResources API: devices pods hold through DRA claims are not advertised as free.
            - name: pod-resources
              mountPath: {{ $kubelet }}/pod-resources
              readOnly: true
            {{- range .d.hostMounts }}
            - name: {{ .name }}
              mountPath: {{ .mountPath }}
              {{- if .readOnly }}
              readOnly: true
              {{- end }}
            {{- end }}
            - name: tmp
              mountPath: /tmp
            {{- include "accel-dra.fakeHostMount" . | nindent 12 }}
      volumes:
        - name: device-plugins
          hostPath:
            path: {{ $devicePlugins }}
            type: Directory
        - name: plugins-registry
          hostPath:
            path: {{ $kubelet }}/plugins_registry
            type: DirectoryOrCreate
        - name: dra-driver-presence
          hostPath:
            path: {{ $kubelet }}/plugins/{{ .d.draDriverName }}
            type: DirectoryOrCreate
        - name: pod-resources
          hostPath:
            path: {{ $kubelet }}/pod-resources
            type: DirectoryOrCreate
        {{- range .d.hostMounts }}
        - name: {{ .name }}
          hostPath:
            path: {{ .hostPath }}
            type: {{ .type }}
        {{- end }}
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
        {{- include "accel-dra.fakeHostVolume" . | nindent 8 }}
{{- end }}
