{{/* One DRA driver's objects: ServiceAccount, ClusterRole and binding, the own-node ValidatingAdmissionPolicy and
     binding, DeviceClass, metrics Service (when metrics.enabled), the opaque-config admission webhook (when
     admissionWebhook.enabled, _admission.tpl) and the kubelet-plugin DaemonSet.

     Call with (dict "root" $ "d" DRIVER); DRIVER is a dict:
       driverName          the DRA driver name (ResourceSlice spec.driver), e.g. neuron.aws.com
       displayName         for messages: "the <displayName> DRA driver ..."; lower-cased in the match condition name
       namespace           where the namespaced objects go
       labels              the chart's common labels (YAML text)
       selectorLabels      the pods' selector labels (YAML text; immutable once installed)
       extraPodLabels      more pod labels (YAML text, optional)
       names               dict: daemonSet, serviceAccount, clusterRole, policy, metricsService, deviceClass, container
       command             the console script (run as `<command> serve`)
       extendedResourceName  the DeviceClass's extendedResourceName when config.extendedResource is on
       deviceClassSelector   optional: the DeviceClass's CEL selector (default: device.driver == driverName)
       nodeVerbs           verbs on nodes (the slices' owner reference needs get)
       config              the chart's draDriver values (see either chart's values.yaml)
       pod                 dict: podLabels, podAnnotations, priorityClassName, tolerations, nodeSelector, affinity,
                           securityContext
       devicePluginsDirType  hostPath type of the device-plugins directory
       terminationMessagePath  optional (a read-only /dev over /dev needs another path)
       hostMounts          list of dict: name, mountPath, hostPath, type, readOnly: the driver's own host files,
                           mounted after the device-plugins directory */}}
{{- define "accel-dra.driver" -}}
{{- include "accel-dra.serviceAccount" . }}
---
{{ include "accel-dra.rbac" . }}
---
{{ include "accel-dra.admissionPolicy" . }}
---
{{ include "accel-dra.deviceClass" . }}
{{- if .d.config.metrics.enabled }}
---
{{ include "accel-dra.metricsService" . }}
{{- end }}
{{- if (.d.config.admissionWebhook | default dict).enabled }}
---
{{ include "accel-dra.admissionWebhook" . }}
{{- end }}
---
{{ include "accel-dra.daemonSet" . }}
{{- if ne .d.config.handoffOnUninstall false }}
---
{{ include "accel-dra.handoffHook" . }}
{{- end }}
{{- end }}

{{- define "accel-dra.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .d.names.serviceAccount }}
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
{{- end }}

{{/* Exactly the verbs the driver uses (a test against the real API server checks that the rest is refused).
     ResourceSlice writes are further limited to the driver's own node and driver name by the admission policy. */}}
{{- define "accel-dra.rbac" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ .d.names.clusterRole }}
  labels:
    {{- .d.labels | nindent 4 }}
rules:
  # Read the claim the kubelet asks the driver to prepare (one GET by namespace and name, never a list).
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceclaims"]
    verbs: ["get"]
  {{- if .d.config.deviceStatus }}
  # Write status.devices of the claims it prepared (server-side apply of resourceclaims/status). With granular
  # status authorization (on by default since 1.36) the API server also checks the synthetic resourceclaims/driver
  # subresource named by the driver, verb associated-node:patch: allowed only for claims allocated on the node the
  # driver's pod-bound token names. Changing status.allocation or reservedFor needs resourceclaims/binding: not given.
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceclaims/status"]
    verbs: ["patch"]
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceclaims/driver"]
    resourceNames: [{{ .d.driverName | quote }}]
    verbs: ["associated-node:patch"]
  {{- end }}
  # The slices' owner reference points at the driver's Node (a driver that labels its Node also patches it); watch:
  # the driver follows its own Node's topology labels (fieldSelector metadata.name; RBAC cannot name a per-node name).
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: {{ toJson .d.nodeVerbs }}
  # Publish this node's devices: list and watch the pool, create, replace (update) and delete its slices.
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceslices"]
    verbs: ["list", "watch", "create", "update", "delete"]
  # Raise a Warning Event on the pod of a claim that cannot be prepared (events.k8s.io/v1, server-side apply: create
  # the first time, patch to count the kubelet's retries in the Event's series).
  - apiGroups: ["events.k8s.io"]
    resources: ["events"]
    verbs: ["create", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .d.names.clusterRole }}
  labels:
    {{- .d.labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ .d.names.clusterRole }}
subjects:
  - kind: ServiceAccount
    name: {{ .d.names.serviceAccount }}
    namespace: {{ .d.namespace }}
---
{{- /* At shutdown the driver reads its own DaemonSet (is it gone or no longer meant for this node?) to tell an
       uninstall from a pod restart: only that one DaemonSet, only get. */}}
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .d.names.daemonSet }}-own-daemonset
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
rules:
  - apiGroups: ["apps"]
    resources: ["daemonsets"]
    resourceNames: [{{ .d.names.daemonSet | quote }}]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ .d.names.daemonSet }}-own-daemonset
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ .d.names.daemonSet }}-own-daemonset
subjects:
  - kind: ServiceAccount
    name: {{ .d.names.serviceAccount }}
    namespace: {{ .d.namespace }}
{{- end }}

{{/* RBAC cannot say "only your own node". The driver's token is bound to its Pod, so it carries the Pod's node in the
     authentication.kubernetes.io/node-name extra (ServiceAccountTokenPodNodeInfo); this policy lets the driver create,
     update and delete only ResourceSlices of its own driver name whose spec.nodeName and pool name are that node. */}}
{{- define "accel-dra.admissionPolicy" -}}
{{- $user := printf "system:serviceaccount:%s:%s" .d.namespace .d.names.serviceAccount }}
{{- $who := printf "the %s DRA driver" .d.displayName }}
{{- $driver := .d.driverName }}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ .d.names.policy }}
  labels:
    {{- .d.labels | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["resource.k8s.io"]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE", "DELETE"]
        resources: ["resourceslices"]
  matchConditions:
    - name: {{ printf "%s-dra-driver-only" (lower .d.displayName) }}
      expression: request.userInfo.username == {{ $user | quote }}
  variables:
    - name: driverNode
      expression: "request.userInfo.?extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"
    - name: newNode
      expression: "request.operation == 'DELETE' ? '' : object.spec.?nodeName.orValue('')"
    - name: oldNode
      expression: "request.operation == 'CREATE' ? '' : oldObject.spec.?nodeName.orValue('')"
    - name: newPool
      expression: "request.operation == 'DELETE' ? '' : object.spec.?pool.?name.orValue('')"
    - name: oldPool
      expression: "request.operation == 'CREATE' ? '' : oldObject.spec.?pool.?name.orValue('')"
    - name: sliceDriver
      expression: "request.operation == 'DELETE' ? oldObject.spec.driver : object.spec.driver"
  validations:
    - expression: "variables.driverNode != ''"
      message: >-
        {{ $who }}'s credentials name no node: it must run in a Pod bound to a node, with a service
        account token that carries the node name (feature ServiceAccountTokenPodNodeInfo)
    - expression: "variables.sliceDriver == '{{ $driver }}'"
      messageExpression: >-
        "{{ $who }} may only write ResourceSlices of driver {{ $driver }}, not '" + variables.sliceDriver + "'"
    - expression: "request.operation == 'DELETE' || variables.newNode == variables.driverNode"
      messageExpression: >-
        "{{ $who }} on node '" + variables.driverNode + "' may only write ResourceSlices of its own node, not " +
        (variables.newNode == '' ? "slices without a node" : "slices of node '" + variables.newNode + "'")
    - expression: "request.operation == 'CREATE' || variables.oldNode == variables.driverNode"
      messageExpression: >-
        "{{ $who }} on node '" + variables.driverNode + "' may only change ResourceSlices of its own node, not " +
        (variables.oldNode == '' ? "slices without a node" : "slices of node '" + variables.oldNode + "'")
    - expression: "request.operation == 'DELETE' || variables.newPool == variables.driverNode"
      messageExpression: >-
        "{{ $who }} on node '" + variables.driverNode + "' may only write ResourceSlices in its own node's " +
        "pool '" + variables.driverNode + "', not in pool '" + variables.newPool + "'"
    - expression: "request.operation == 'CREATE' || variables.oldPool == variables.driverNode"
      messageExpression: >-
        "{{ $who }} on node '" + variables.driverNode + "' may only change ResourceSlices in its own " +
        "node's pool '" + variables.driverNode + "', not in pool '" + variables.oldPool + "'"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .d.names.policy }}
  labels:
    {{- .d.labels | nindent 4 }}
spec:
  policyName: {{ .d.names.policy }}
  validationActions: ["Deny"]
{{- end }}

{{- define "accel-dra.deviceClass" -}}
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: {{ .d.names.deviceClass }}
  labels:
    {{- .d.labels | nindent 4 }}
spec:
  {{- if .d.config.extendedResource }}
  # Pods asking for the device plugin's resource get devices of this class (DRAExtendedResource).
  extendedResourceName: {{ .d.extendedResourceName }}
  {{- end }}
  selectors:
    - cel:
        expression: {{ .d.deviceClassSelector | default (printf "device.driver == %q" .d.driverName) }}
{{- end }}

{{/* A headless Service selecting the driver's pods, for Prometheus. */}}
{{- define "accel-dra.metricsService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ .d.names.metricsService }}
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
    {{- .d.selectorLabels | nindent 4 }}
spec:
  clusterIP: None
  selector:
    {{- .d.selectorLabels | nindent 4 }}
  ports:
    - name: metrics
      port: {{ .d.config.metrics.port }}
      targetPort: metrics
      protocol: TCP
{{- end }}
