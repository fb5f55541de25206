{{/* The pre-delete hook of a DRA release (draDriver.handoffOnUninstall): before helm deletes the release's
     service account and RBAC, a Job deletes the driver's DaemonSet in the foreground and waits, so each driver stops
     with its rights intact, removes its ResourceSlices and presence file, and a device plugin on the node serves it
     within seconds instead of after the kubelet's 30 s slice wipe (docs/charts.md, "Device plugin and DRA driver on
     one node"). The Job never fails the uninstall (`<command> handoff` exits 0 on any error). Its account may only
     get and delete that one DaemonSet. Call with the same (dict "root" $ "d" DRIVER) as accel-dra.driver. */}}
{{- define "accel-dra.handoffHook" -}}
{{- $name := printf "%s-handoff" .d.names.daemonSet }}
{{- $hook := dict "helm.sh/hook" "pre-delete" "helm.sh/hook-delete-policy" "before-hook-creation,hook-succeeded" }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name }}
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
  annotations:
    {{- toYaml (merge (dict "helm.sh/hook-weight" "-10") $hook) | nindent 4 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $name }}
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
  annotations:
    {{- toYaml (merge (dict "helm.sh/hook-weight" "-10") $hook) | nindent 4 }}
rules:
  - apiGroups: ["apps"]
    resources: ["daemonsets"]
    resourceNames: [{{ .d.names.daemonSet | quote }}]
    verbs: ["get", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $name }}
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
  annotations:
    {{- toYaml (merge (dict "helm.sh/hook-weight" "-10") $hook) | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $name }}
subjects:
  - kind: ServiceAccount
    name: {{ $name }}
    namespace: {{ .d.namespace }}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ $name }}
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
  annotations:
    {{- toYaml (merge (dict "helm.sh/hook-weight" "0") $hook) | nindent 4 }}
spec:
  backoffLimit: 0
  activeDeadlineSeconds: 180
  ttlSecondsAfterFinished: 300
  template:
    metadata:
      labels:
        {{- .d.labels | nindent 8 }}
    spec:
      serviceAccountName: {{ $name }}
      restartPolicy: Never
      enableServiceLinks: false
      tolerations:
        - operator: Exists
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        seccompProfile:
          type: RuntimeDefault
      {{- with .root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: handoff
          image: {{ .d.image }}
          imagePullPolicy: {{ .root.Values.image.pullPolicy }}
          command: [{{ .d.command | quote }}, "handoff", "--namespace", {{ .d.namespace | quote }}, "--daemonset",
                    {{ .d.names.daemonSet | quote }}, "--timeout", "150"]
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: [ALL]
          resources:
            requests: {cpu: 10m, memory: 64Mi}
            limits: {memory: 128Mi}
{{- end }}
