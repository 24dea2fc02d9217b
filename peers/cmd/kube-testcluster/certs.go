package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"

	"k8s.io/client-go/util/keyutil"
)

// Keys and certificates live only as long as the cluster's directory: a day is plenty, and a
// fresh set each start means no test ever trusts another run's CA.
const certLifetime = 24 * time.Hour

type certificates struct {
	caFile, certFile, keyFile, saKeyFile string
}

func newKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func writeKey(path string, key crypto.PrivateKey) error {
	data, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return err
	}
	return keyutil.WriteKey(path, data)
}

// makeCertificates writes a CA, a serving certificate it signs for 127.0.0.1, localhost and, if
// listenIP is not empty, listenIP and the kubernetes Service's ClusterIP, and the key that signs
// (and verifies) service-account tokens.
func makeCertificates(dir, listenIP string) (certificates, error) {
	c := certificates{
		caFile:    dir + "/ca.crt",
		certFile:  dir + "/apiserver.crt",
		keyFile:   dir + "/apiserver.key",
		saKeyFile: dir + "/service-account.key",
	}
	now := time.Now().Add(-time.Minute) // tolerate a little clock skew between processes
	caKey, err := newKey()
	if err != nil {
		return c, err
	}
	caSerial, err := serialNumber()
	if err != nil {
		return c, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          caSerial,
		Subject:               pkix.Name{CommonName: "kube-testcluster-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(certLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, caKey.Public(), caKey)
	if err != nil {
		return c, fmt.Errorf("CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return c, err
	}
	serverKey, err := newKey()
	if err != nil {
		return c, err
	}
	serverSerial, err := serialNumber()
	if err != nil {
		return c, err
	}
	serverTemplate := &x509.Certificate{
		SerialNumber: serverSerial,
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now,
		NotAfter:     now.Add(certLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  serverIPs(listenIP),
		DNSNames:     []string{"localhost"},
	}
	serverDER, err := x509.CreateCertificate(rand.Reader, serverTemplate, caCert, serverKey.Public(), caKey)
	if err != nil {
		return c, fmt.Errorf("serving certificate: %w", err)
	}
	saKey, err := newKey()
	if err != nil {
		return c, err
	}
	for _, step := range []error{
		writePEM(c.caFile, "CERTIFICATE", caDER),
		writePEM(c.certFile, "CERTIFICATE", serverDER),
		writeKey(c.keyFile, serverKey),
		writeKey(c.saKeyFile, saKey),
	} {
		if step != nil {
			return c, step
		}
	}
	return c, nil
}

// kubernetesServiceIP is the ClusterIP of the default/kubernetes Service: the first address of
// kube-apiserver's default --service-cluster-ip-range, 10.0.0.0/24. In-cluster clients (pods)
// dial it and check the certificate against it; a container node routes it to listenIP.
const kubernetesServiceIP = "10.0.0.1"

func serverIPs(listenIP string) []net.IP {
	ips := []net.IP{net.ParseIP("127.0.0.1")}
	if listenIP != "" {
		ips = append(ips, net.ParseIP(listenIP), net.ParseIP(kubernetesServiceIP))
	}
	return ips
}
