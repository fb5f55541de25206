{{/* The admission webhook that checks one DRA driver's opaque configs when a ResourceClaim, ResourceClaimTemplate
     or DeviceClass is created or updated (`<command> webhook`, accel_core/dra/admission.py): the profile's own decoder refuses
     what prepare would refuse, with the same line. Objects: a TLS Secret (chart-made CA and serving certificate),
     a Deployment, a Service and a ValidatingWebhookConfiguration whose caBundle is that CA.

     Call with (dict "root" $ "d" DRIVER), see _driver.tpl; reads .d.config.admissionWebhook:
       failurePolicy    Ignore (default): while the webhook is unreachable claims are admitted unchecked and the
                        driver still refuses a bad config at prepare (claim condition and pod Event); Fail: no claim
                        carrying this driver's configs is admitted while it is down
       timeoutSeconds, replicas, port, certValidityDays, resources, nodeSelector, tolerations, priorityClassName

     Only objects that carry an opaque config of this driver are sent (matchConditions), so claims of other drivers
     and claims without configs never wait on this webhook. */}}

{{- define "accel-dra.admissionWebhook.name" -}}
{{ printf "%s-admission-webhook" .d.names.clusterRole }}
{{- end }}

{{- define "accel-dra.admissionWebhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "accel-dra.admissionWebhook.name" . }}
app.kubernetes.io/component: admission-webhook
{{- end }}

{{/* The chart-made CA and serving certificate as YAML of base64 values (caCrt, crt, key) and their validity
     (notBefore, notAfter: seconds since the epoch): those the Secret already holds (helm lookup, so an upgrade keeps
     them) while more than a third of their lifetime is left, else new ones (genCA, genSignedCert). Include it ONCE
     per render: without a usable Secret every call makes a new CA. */}}
{{- define "accel-dra.admissionWebhook.tls" -}}
{{- $w := .d.config.admissionWebhook -}}
{{- $name := include "accel-dra.admissionWebhook.name" . -}}
{{- $obj := (lookup "v1" "Secret" .d.namespace (printf "%s-tls" $name)) | default dict -}}
{{- $data := $obj.data | default dict -}}
{{- $notes := (get ($obj.metadata | default dict) "annotations") | default dict -}}
{{- $nb := get $notes "accel-dra.aws/tls-not-before" | default "0" | int64 -}}
{{- $na := get $notes "accel-dra.aws/tls-not-after" | default "0" | int64 -}}
{{- $now := now | unixEpoch | int64 -}}
{{- $fresh := and (gt $na $now) (gt (mul (sub $na $now) 3) (sub $na $nb)) -}}
{{- if and $fresh (get $data "tls.crt") (get $data "tls.key") (get $data "ca.crt") -}}
caCrt: {{ get $data "ca.crt" }}
crt: {{ get $data "tls.crt" }}
key: {{ get $data "tls.key" }}
notBefore: {{ $nb | quote }}
notAfter: {{ $na | quote }}
{{- else -}}
{{- $days := int $w.certValidityDays -}}
{{- $svc := printf "%s.%s.svc" $name .d.namespace -}}
{{- $ca := genCA (printf "%s-ca" $name) $days -}}
{{- $cert := genSignedCert $svc nil (list $svc (printf "%s.cluster.local" $svc)) $days $ca -}}
caCrt: {{ $ca.Cert | b64enc }}
crt: {{ $cert.Cert | b64enc }}
key: {{ $cert.Key | b64enc }}
notBefore: {{ $now | quote }}
notAfter: {{ add $now (mul $days 86400) | quote }}
{{- end -}}
{{- end }}

{{- define "accel-dra.admissionWebhook" -}}
{{- $w := .d.config.admissionWebhook }}
{{- $name := include "accel-dra.admissionWebhook.name" . }}
{{- $tls := include "accel-dra.admissionWebhook.tls" . | fromYaml }}
{{- if not (has $w.failurePolicy (list "Ignore" "Fail")) }}
{{- fail (printf "draDriver.admissionWebhook.failurePolicy=%v: give Ignore or Fail" $w.failurePolicy) }}
{{- end }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ $name }}-tls
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
  annotations:
    accel-dra.aws/tls-not-before: {{ $tls.notBefore | quote }}
    accel-dra.aws/tls-not-after: {{ $tls.notAfter | quote }}
type: kubernetes.io/tls
data:
  ca.crt: {{ $tls.caCrt }}
  tls.crt: {{ $tls.crt }}
  tls.key: {{ $tls.key }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
    {{- include "accel-dra.admissionWebhook.selectorLabels" . | nindent 4 }}
spec:
  replicas: {{ $w.replicas }}
  selector:
    matchLabels:
      {{- include "accel-dra.admissionWebhook.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- .d.labels | nindent 8 }}
        {{- include "accel-dra.admissionWebhook.selectorLabels" . | nindent 8 }}
      annotations:
        # a renewed certificate rolls the pods (they read it once, at start)
        checksum/tls: {{ $tls.crt | sha256sum }}
    spec:
      automountServiceAccountToken: false  # it reads nothing from the API server
      enableServiceLinks: false
      {{- with $w.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        fsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
      {{- with .root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $w.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $w.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: webhook
          image: {{ .d.image }}
          imagePullPolicy: {{ .root.Values.image.pullPolicy }}
          command: [{{ .d.command | quote }}, "webhook"]
          env:
            - name: WEBHOOK_PORT
              value: {{ $w.port | quote }}
            - name: TLS_CERT_FILE
              value: /etc/admission-webhook/tls/tls.crt
            - name: TLS_KEY_FILE
              value: /etc/admission-webhook/tls/tls.key
            - name: LOG_LEVEL
              value: {{ .root.Values.logLevel | quote }}
            - name: LOG_FORMAT
              value: {{ .root.Values.logFormat | quote }}
          ports:
            - name: https
              containerPort: {{ $w.port }}
              protocol: TCP
          readinessProbe:
            httpGet:
              path: /healthz
              port: https
              scheme: HTTPS
            periodSeconds: 10
          livenessProbe:
            httpGet:
              path: /healthz
              port: https
              scheme: HTTPS
            initialDelaySeconds: 10
            periodSeconds: 20
          {{- with $w.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: [ALL]
          volumeMounts:
            - name: tls
              mountPath: /etc/admission-webhook/tls
              readOnly: true
      volumes:
        - name: tls
          secret:
            secretName: {{ $name }}-tls
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  namespace: {{ .d.namespace }}
  labels:
    {{- .d.labels | nindent 4 }}
spec:
  selector:
    {{- include "accel-dra.admissionWebhook.selectorLabels" . | nindent 4 }}
  ports:
    - name: https
      port: 443
      targetPort: https
      protocol: TCP
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: {{ $name }}
  labels:
    {{- .d.labels | nindent 4 }}
webhooks:
  - name: {{ printf "opaque-configs.%s" .d.driverName }}
    admissionReviewVersions: ["v1"]
    sideEffects: None
    failurePolicy: {{ $w.failurePolicy }}
    timeoutSeconds: {{ $w.timeoutSeconds }}
    clientConfig:
      service:
        name: {{ $name }}
        namespace: {{ .d.namespace }}
        path: /validate
        port: 443
      caBundle: {{ $tls.caCrt }}
    rules:
      - apiGroups: ["resource.k8s.io"]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["resourceclaims", "resourceclaimtemplates"]
        scope: Namespaced
      - apiGroups: ["resource.k8s.io"]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["deviceclasses"]
        scope: Cluster
    matchConditions:
      # a ResourceClaim's configs are in spec.devices.config, a template's in spec.spec.devices.config, a
      # DeviceClass's in spec.config
      - name: {{ printf "has-%s-opaque-config" (lower .d.displayName) }}
        expression: >-
          object.spec.?devices.?config.orValue([]).exists(c, c.?opaque.?driver.orValue('') == {{ .d.driverName | squote }}) ||
          object.spec.?spec.?devices.?config.orValue([]).exists(c, c.?opaque.?driver.orValue('') == {{ .d.driverName | squote }}) ||
          object.spec.?config.orValue([]).exists(c, c.?opaque.?driver.orValue('') == {{ .d.driverName | squote }})
{{- end }}
