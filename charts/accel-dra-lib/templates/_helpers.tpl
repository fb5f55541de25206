{{/* Helpers of the DRA library chart. Every template takes (dict "root" $ "d" DRIVER), DRIVER being the block a
     chart passes to "accel-dra.driver" (see _driver.tpl). Top-level values read from the chart: image.pullPolicy,
     imagePullSecrets, kubeletRootDir, devicePluginsDir, logLevel, logFormat, nodeSelection, fakeHost.path. */}}

{{- define "accel-dra.kubeletRoot" -}}
{{ trimSuffix "/" .root.Values.kubeletRootDir }}
{{- end }}

{{- define "accel-dra.devicePluginsDir" -}}
{{ trimSuffix "/" .root.Values.devicePluginsDir }}
{{- end }}

{{/* The pod's `affinity` if set, else a required node affinity from nodeSelection: one term per rule (terms are
     ORed), each also excluding the listed compute types. .d.side: "device-plugin" or (default) the DRA driver. */}}
{{- define "accel-dra.affinity" -}}
{{- if .d.pod.affinity -}}
{{ toYaml .d.pod.affinity }}
{{- else -}}
{{- $sel := .root.Values.nodeSelection -}}
{{- $common := list (dict "key" "kubernetes.io/os" "operator" "In" "values" (list "linux")) -}}
{{- if $sel.excludeComputeTypes -}}
{{- $common = append $common (dict "key" "eks.amazonaws.com/compute-type" "operator" "NotIn" "values" $sel.excludeComputeTypes) -}}
{{- end -}}
{{- with $sel.driverLabel -}}{{- /* migration, node by node: the DRA driver runs where this label is "dra", a
     device plugin (.d.side "device-plugin") where it is not */ -}}
{{- $common = append $common (dict "key" . "operator" (ternary "NotIn" "In" (eq ($.d.side | default "") "device-plugin")) "values" (list "dra")) -}}
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

{{/* METRICS_ADDRESS from metrics.address: podIP and hostIP come from the downward API, anything else is literal.
     Call with the address. */}}
{{- define "accel-dra.metricsAddressEnv" -}}
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
{{- define "accel-dra.fakeHostArgs" -}}
{{- with .root.Values.fakeHost.path }}, "--host-root", {{ . | quote }}{{ end }}
{{- end }}

{{- define "accel-dra.fakeHostMount" -}}
{{- with .root.Values.fakeHost.path }}
- name: fake-host
  mountPath: {{ . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "accel-dra.fakeHostVolume" -}}
{{- with .root.Values.fakeHost.path }}
- name: fake-host
  hostPath:
    path: {{ . }}
    type: Directory
{{- end }}
{{- end }}

{{/* Host path values a chart mounts, checked before anything renders. Call with (dict "paths" (dict NAME VALUE ...)
     "fakeHost" .Values.fakeHost.path "kubelet" KUBELET_ROOT "devicePlugins" DIR "cdi" DIR).
     - Only letters, digits and . _ / @ + - in any of them (the manifests carry them unquoted), no "." or ".."
       segment and no "//": a host path names its directory itself.
     - fakeHost.path is a tree the root daemons read as their host: never "/", never a directory that holds a system
       or kubelet directory (/var, /var/lib, the kubelet root...), never inside one the node keeps secrets or devices
       in (/etc, /proc, /sys, /dev, /boot, /run, the kubelet root with its PKI, the device-plugins or CDI directory). */}}
{{- define "accel-dra.checkHostPaths" -}}
{{- range $name, $value := .paths -}}
{{- if and $value (regexMatch "[^A-Za-z0-9._/@+-]" $value) -}}
{{- fail (printf "%s=%q: a host path may hold only letters, digits and . _ / @ + - (it is written into the manifests as it is: a space, '#' or ':' would change what they mount)" $name $value) -}}
{{- end -}}
{{- if and $value (regexMatch "(^|/)\\.\\.?(/|$)" $value) -}}
{{- fail (printf "%s=%s: '.' and '..' segments are not allowed in a host path; give the directory itself" $name $value) -}}
{{- end -}}
{{- if and $value (contains "//" $value) -}}
{{- fail (printf "%s=%s: '//' is not allowed in a host path" $name $value) -}}
{{- end -}}
{{- end -}}
{{- with .fakeHost -}}
{{- $fh := trimSuffix "/" . -}}
{{- if eq $fh "" -}}
{{- fail "fakeHost.path=/ would hand the node's whole root (kubelet PKI included) to the daemons as a fake host; give a directory that holds a generated fake-sysfs tree" -}}
{{- end -}}
{{- $kept := list "/etc" "/proc" "/sys" "/dev" "/boot" "/run" "/var/run" $.kubelet $.devicePlugins -}}
{{- if $.cdi -}}{{- $kept = append $kept $.cdi -}}{{- end -}}
{{- $holders := concat $kept (list "/usr" "/var" "/var/lib" "/root" "/home" "/opt" "/bin" "/sbin" "/lib" "/lib64" "/srv" "/mnt") -}}
{{- range $holders -}}
{{- if hasPrefix (printf "%s/" $fh) (printf "%s/" .) -}}
{{- fail (printf "fakeHost.path=%s is or holds the node's %s: give a directory of its own for the fake-sysfs tree" $fh .) -}}
{{- end -}}
{{- end -}}
{{- range $kept -}}
{{- if hasPrefix (printf "%s/" .) (printf "%s/" $fh) -}}
{{- fail (printf "fakeHost.path=%s is inside the node's %s: give a directory of its own for the fake-sysfs tree" $fh .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
