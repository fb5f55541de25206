{{/* The kubelet-plugin DaemonSet of one DRA driver. Call with (dict "root" $ "d" DRIVER), see _driver.tpl. */}}
{{- define "accel-dra.daemonSet" -}}
{{- $c := .d.config }}
{{- $pod := .d.pod }}
{{- $root := .root }}
{{- $kubelet := include "accel-dra.kubeletRoot" . }}
{{- $devicePlugins := include "accel-dra.devicePluginsDir" . }}
{{- $cdi := trimSuffix "/" $c.cdiRootDir }}
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
    {{- toYaml $c.updateStrategy | nindent 4 }}
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
      enableServiceLinks: false
      priorityClassName: {{ $pod.priorityClassName }}
      hostNetwork: {{ $c.hostNetwork }}
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
        {{- include "accel-dra.affinity" . | nindent 8 }}
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
              value: {{ ternary $c.metrics.port 0 $c.metrics.enabled | quote }}
            {{- if $c.metrics.enabled }}
            {{- include "accel-dra.metricsAddressEnv" $c.metrics.address | nindent 12 }}
            {{- end }}
            # Publish the ResourceSlices once the kubelet has registered the plugin (at most 30 s later): a pod
            # placed here before that would fail its prepare and wait for the kubelet's retry.
            - name: REGISTRATION_WAIT
              value: "30"
            # Per-pod socket names, so that old and new pods coexist during a rolling update.
            - name: POD_UID
              valueFrom:
                fieldRef:
                  fieldPath: metadata.uid
            # Asked at shutdown: is the DaemonSet gone or no longer meant for this node? Then the driver leaves for
            # good and the device plugin may serve the node at once; else (a pod restart) the device plugin keeps
            # standing down (the DRA driver wins).
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            - name: DAEMONSET_NAME
              value: {{ .d.names.daemonSet | quote }}
            - name: CDI_ROOT
              value: {{ $cdi | quote }}
            - name: KUBELET_REGISTRAR_DIRECTORY_PATH
              value: {{ printf "%s/plugins_registry" $kubelet | quote }}
            - name: KUBELET_PLUGINS_DIRECTORY_PATH
              value: {{ printf "%s/plugins" $kubelet | quote }}
            - name: HEALTHCHECK_PORT
              value: {{ $c.healthcheckPort | quote }}
            - name: DEVICE_STATUS
              value: {{ ternary "on" "off" $c.deviceStatus | quote }}
            - name: DEVICE_METADATA
              value: {{ ternary "on" "off" (dig "deviceMetadata" "enabled" true $c) | quote }}
            - name: UNHEALTHY_TAINT_EFFECT
              value: {{ $c.unhealthyTaintEffect | quote }}
            {{- if hasKey $c "unhealthyNoExecuteAfterSeconds" }}
            - name: UNHEALTHY_NOEXECUTE_AFTER
              value: {{ $c.unhealthyNoExecuteAfterSeconds | toString | quote }}
            {{- end }}
            {{- with $c.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: healthz
              containerPort: {{ $c.healthcheckPort }}
              protocol: TCP
            {{- if $c.metrics.enabled }}
            - name: metrics
              containerPort: {{ $c.metrics.port }}
              protocol: TCP
            {{- end }}
          livenessProbe:
            grpc:
              port: {{ $c.healthcheckPort }}
              service: liveness
            {{- toYaml $c.livenessProbe | nindent 12 }}
          securityContext:
            {{- toYaml $pod.securityContext | nindent 12 }}
          resources:
            {{- toYaml $c.resources | nindent 12 }}
          {{- with .d.terminationMessagePath }}
          terminationMessagePath: {{ . }}
          {{- end }}
          terminationMessagePolicy: FallbackToLogsOnError
          volumeMounts:
            # Registration socket (<driver>-<pod uid>-reg.sock) that the kubelet's plugin watcher finds.
            - name: plugins-registry
              mountPath: {{ $kubelet }}/plugins_registry
            # DRA gRPC socket, checkpoint.
            - name: plugins
              mountPath: {{ $kubelet }}/plugins
            # CDI specs written at prepare time and read by the container runtime.
            - name: cdi
              mountPath: {{ $cdi }}
            # Read-only look for a device plugin of the same hardware on this node (the DRA driver wins: it serves
            # anyway, and the device plugin stands down).
            - name: device-plugins
              mountPath: {{ $devicePlugins }}
              readOnly: true
            # The kubelet's PodResources API: devices that pods still hold through the device plugin stay out of the
            # ResourceSlices until those pods end.
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
        - name: plugins-registry
          hostPath:
            path: {{ $kubelet }}/plugins_registry
            type: Directory
        - name: plugins
          hostPath:
            path: {{ $kubelet }}/plugins
            type: Directory
        - name: cdi
          hostPath:
            path: {{ $cdi }}
            type: DirectoryOrCreate
        - name: device-plugins
          hostPath:
            path: {{ $devicePlugins }}
            type: {{ .d.devicePluginsDirType }}
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
