// The network-policy-api conformance profiles, run as upstream's
// conformance/conformance_profile_test.go runs them, with two additions for a lab whose
// kernel may lack SCTP sockets:
//
//   - -base-manifests picks the base manifests inside this package's copy of the
//     module's (Manifests): base/manifests-no-sctp.yaml is upstream's with the SCTP
//     servers' environment renamed, so those containers run and serve nothing
//     (agnhost porter exits when it cannot open an SCTP socket, and the base pods
//     would never be Ready).
//   - -skip-tests names tests (ShortName, comma-separated) the suite reports as
//     SKIPPED, not passed (upstream's SkipTests option).
package npapiconformance

import (
	"flag"
	"os"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/yaml"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/flags"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

var (
	baseManifests = flag.String("base-manifests", "base/manifests.yaml",
		"base manifests inside the embedded copy (base/manifests-no-sctp.yaml: no SCTP servers)")
	skipTests = flag.String("skip-tests", "", "tests (ShortName, comma-separated) reported as skipped")
)

func TestConformanceProfiles(t *testing.T) {
	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatalf("loading the Kubernetes config: %v", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("creating the Kubernetes client: %v", err)
	}
	kubeConfig, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		t.Fatalf("building the client-go config: %v", err)
	}
	clientSet, err := kubernetes.NewForConfig(kubeConfig)
	if err != nil {
		t.Fatalf("creating the clientset: %v", err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatalf("installing the API scheme: %v", err)
	}
	if err := apiextensionsv1.AddToScheme(c.Scheme()); err != nil {
		t.Fatalf("installing the apiextensions scheme: %v", err)
	}
	profiles := suite.ParseConformanceProfiles(*flags.ConformanceProfiles)
	if profiles.Len() == 0 {
		t.Fatalf("-conformance-profiles is required")
	}
	implementation, err := suite.ParseImplementation(
		*flags.ImplementationOrganization, *flags.ImplementationProject,
		*flags.ImplementationURL, *flags.ImplementationVersion,
		*flags.ImplementationContact, *flags.ImplementationAdditionalInformation,
	)
	if err != nil {
		t.Fatalf("parsing the implementation's details: %v", err)
	}
	var skipped []string
	for _, name := range strings.Split(*skipTests, ",") {
		if name = strings.TrimSpace(name); name != "" {
			skipped = append(skipped, name)
		}
	}
	fs := Manifests
	cSuite, err := suite.NewConformanceProfileTestSuite(suite.ConformanceProfileOptions{
		Options: suite.Options{
			Client:                     c,
			ClientSet:                  clientSet,
			KubeConfig:                 *cfg,
			Debug:                      *flags.ShowDebug,
			CleanupBaseResources:       *flags.CleanupBaseResources,
			SupportedFeatures:          suite.ParseSupportedFeatures(*flags.SupportedFeatures),
			ExemptFeatures:             suite.ParseSupportedFeatures(*flags.ExemptFeatures),
			EnableAllSupportedFeatures: *flags.EnableAllSupportedFeatures,
			BaseManifests:              *baseManifests,
			SkipTests:                  skipped,
			FS:                         &fs,
		},
		Implementation:      *implementation,
		ConformanceProfiles: profiles,
	})
	if err != nil {
		t.Fatalf("creating the conformance profile suite: %v", err)
	}
	cSuite.Setup(t)
	if err := cSuite.Run(t, tests.ConformanceTests); err != nil {
		t.Fatalf("running the suite: %v", err)
	}
	report, err := cSuite.Report()
	if err != nil {
		t.Fatalf("generating the conformance report: %v", err)
	}
	raw, err := yaml.Marshal(report)
	if err != nil {
		t.Fatalf("encoding the report: %v", err)
	}
	if *flags.ReportOutput != "" {
		if err := os.WriteFile(*flags.ReportOutput, raw, 0o644); err != nil {
			t.Fatalf("writing the report: %v", err)
		}
	}
	t.Logf("Conformance report:\n%s", raw)
}
